//! Integration tests of the whole, one binary. Modules:
//! - `contract`: the example scenarios and the CLI's error behaviour (SCENARIO.md);

