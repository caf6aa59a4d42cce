//! placeholder

use super::{ControllerContext, StartError, Started};

/// Starts the controller.
pub fn start(_ctx: &ControllerContext) -> Result<Started, StartError> {
    Ok(Started::Skipped("not implemented yet".into()))
}
