//! The scenario read for plan search (`trainsim search`): every section as for `simulate`,
//! except that `plan` may be missing or partial and `training.micro_batch` may be missing.
//! The plan keys given are constraints the search keeps; [`SearchInput::with_plan`] checks
//! each candidate plan exactly as `simulate` would read it.

use super::reader::{Obj, Result, invalid};
use super::{Scenario, SimOptions, Training, checks, keys, limits, options, plan, training, workload};
use crate::hardware::ClusterSpec;
use crate::workload::Workload;
use serde_json::{Map, Value};

/// The plan keys the search chooses when the scenario leaves them out (with
/// `training.micro_batch`); every other plan key keeps the framework's or the reader's default
/// unless given.
pub const SEARCHED_KEYS: &[&str] = &[
    "dp",
    "tp",
    "tp_mode",
    "pp",
    "schedule",
    "virtual_stages",
    "recompute",
    "sequence_parallel",
    "zero_stage",
    "offload",
    "partition",
    "rank_order",
];

/// Plan keys that describe something other than a parallel layout, which the search refuses.
const NOT_SEARCHED: &[&str] = &["freeze", "token_slices", "token_granularity"];

/// A scenario without its plan, and the plan keys the user fixed.
#[derive(Clone, Debug)]
pub struct SearchInput {
    pub name: String,
    pub workload: Workload,
    pub cluster: ClusterSpec,
    /// `training` with `micro_batch` as given, or 1.
    pub training: Training,
    pub options: SimOptions,
    defaults: Vec<String>,
    /// The `plan` object as given (empty when it was missing or `{}`).
    pub fixed_plan: Map<String, Value>,
    /// `training.micro_batch` as given.
    pub fixed_micro_batch: Option<u32>,
    /// The file as read, to write a complete scenario with a chosen plan.
    pub raw: Value,
    /// Framework profiles to search (`trainsim search --frameworks`); empty: each plan under
    /// the scenario's `training.framework`, or the profile its reader picks.
    pub frameworks: Vec<&'static str>,
}

/// Read a scenario for search: `plan` and `training.micro_batch` may be left out.
pub fn parse_for_search(text: &str, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<SearchInput> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid("(file)", format!("not valid JSON: {e}")))?;
    let root = Obj::new(&v, "")?;
    root.only(keys::ROOT)?;
    let name = root.string("name")?.unwrap_or("unnamed scenario").to_string();
    let mut defaults = Vec::new();
    let workload = workload::parse_workload(&root.req("workload", Obj::obj)?, load)?;
    let cluster = super::cluster::parse_cluster(&root.req("cluster", Obj::obj)?)?;
    let t = root.req("training", Obj::obj)?;
    let fixed_micro_batch = t.uint("micro_batch")?;
    let training = training::parse_training(&t, &workload, &mut defaults)?;
    if fixed_micro_batch.is_none() {
        defaults.retain(|d| !d.starts_with("training.micro_batch"));
    }
    checks::check_fp8(&cluster, &training)?;
    checks::check_attention(&cluster, &training)?;
    let fixed_plan = match root.obj("plan")? {
        None => Map::new(),
        Some(p) => {
            p.only(keys::PLAN)?;
            if let Some(k) = NOT_SEARCHED.iter().find(|k| p.has(k)) {
                return Err(invalid(
                    &p.key(k),
                    "plan search chooses parallel layouts only; leave this key out for `trainsim search`",
                ));
            }
            p.map.clone()
        }
    };
    let options = options::parse_options(root.obj("simulation")?)?;
    super::option_defaults(&options, &cluster, &mut defaults);
    Ok(SearchInput {
        name,
        workload,
        cluster,
        training,
        options,
        defaults,
        fixed_plan,
        fixed_micro_batch,
        raw: v.clone(),
        frameworks: Vec::new(),
    })
}

impl SearchInput {
    /// The scenario with this micro-batch size and `plan` object, checked as `simulate`
    /// checks a file (the same errors, with the same key paths).
    pub fn with_plan(&self, micro_batch: u32, plan_value: &Value) -> Result<Scenario> {
        self.with_choice(micro_batch, plan_value, None)
    }

    /// Search the framework profiles `list` too (names, or `all`: see
    /// [`crate::framework::parse_names`]); an empty list searches none. Refused when the
    /// scenario names its framework (`training.framework` would be both fixed and searched).
    pub fn search_frameworks<S: AsRef<str>>(&mut self, list: &[S]) -> std::result::Result<(), String> {
        if list.is_empty() {
            self.frameworks.clear();
            return Ok(());
        }
        if self.training.framework.is_some() {
            return Err("it searches training.framework, which the scenario gives: leave one out".into());
        }
        self.frameworks = crate::framework::parse_names(list)?;
        Ok(())
    }

    /// [`SearchInput::with_plan`] under `framework` (a profile's name) when given.
    pub fn with_choice(&self, micro_batch: u32, plan_value: &Value, framework: Option<&str>) -> Result<Scenario> {
        let mut defaults = self.defaults.clone();
        let mut training = self.training.clone();
        if let Some(name) = framework {
            training.framework = Some(super::framework::FrameworkSpec::named(name));
        }
        if micro_batch > training.global_batch {
            return Err(invalid(
                "training.micro_batch",
                format!("{micro_batch} is larger than global_batch {}", training.global_batch),
            ));
        }
        training.micro_batch = micro_batch;
        let o = Obj::new(plan_value, "plan")?;
        let plan = plan::parse_plan(&o, &self.workload, &self.cluster, &training, &mut defaults)?;
        let notes = checks::plan_notes(&plan, &self.cluster, &self.workload);
        let scenario = Scenario {
            name: self.name.clone(),
            workload: self.workload.clone(),
            cluster: self.cluster.clone(),
            training,
            plan,
            options: self.options,
            defaults_applied: defaults,
            notes,
            op_rates: Vec::new(),
            run: None,
            freeze: None,
        };
        limits::check(&scenario)?;
        Ok(scenario)
    }

    /// The scenario file with `micro_batch` and `plan` in place of the given ones: what
    /// `trainsim simulate` reads back as [`SearchInput::with_plan`]'s scenario.
    pub fn scenario_file(&self, micro_batch: u32, plan_value: &Value, framework: Option<&str>) -> Value {
        let mut v = self.raw.clone();
        if let Some(root) = v.as_object_mut() {
            if let Some(Value::Object(t)) = root.get_mut("training") {
                t.insert("micro_batch".into(), Value::from(micro_batch));
                if let Some(name) = framework {
                    t.insert("framework".into(), Value::from(name));
                }
            }
            root.insert("plan".into(), plan_value.clone());
        }
        v
    }
}
