//! The int8 arm (W7A8 by the rule): its plan, the stored form, and the loads that build int8 models.
//!
//! Imports run one way: `load` → `stored` → `plan` → `model` (the model knows nothing of the int8 arm but
//! the form a projection was built in).

pub mod load;
pub mod plan;
pub mod stored;

#[cfg(test)]
mod tests;
