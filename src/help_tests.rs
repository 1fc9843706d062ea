//! Every subcommand and every argument of the command line has help text.

use crate::Cli;
use clap::CommandFactory;

#[test]
fn every_subcommand_and_argument_has_help() {
    let cli = Cli::command();
    cli.clone().debug_assert();
    let mut missing = Vec::new();
    let mut subcommands = 0;
    for sub in cli.get_subcommands() {
        subcommands += 1;
        if sub.get_about().is_none_or(|a| a.to_string().trim().is_empty()) {
            missing.push(format!("`trainsim {}` has no description", sub.get_name()));
        }
        for arg in sub.get_arguments() {
            let help = arg.get_help().or(arg.get_long_help()).map(|h| h.to_string()).unwrap_or_default();
            if help.trim().is_empty() {
                missing.push(format!("`trainsim {} {}` has no help", sub.get_name(), arg.get_id()));
            }
        }
    }
    assert!(subcommands >= 10, "only {subcommands} subcommands found");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn help_points_to_the_docs_in_the_repository() {
    let mut cli = Cli::command();
    let help = cli.render_long_help().to_string();
    assert!(help.contains("docs/scenario.md") && help.contains("docs/report.md"), "{help}");
    let simulate = cli.find_subcommand_mut("simulate").expect("simulate").render_long_help().to_string();
    assert!(simulate.contains("docs/scenario.md"), "{simulate}");
    assert!(!simulate.contains("shared/"), "{simulate}");
    for root in ["docs/scenario.md", "docs/report.md"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
        assert!(path.exists(), "{} is named by --help but missing", path.display());
    }
}
