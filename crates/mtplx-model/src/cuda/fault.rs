//! The backend's errors: a driver, NVRTC or launch failure as [`ModelError::Device`].

use crate::error::ModelError;

/// `what` failed with the driver's `e`.
pub(crate) fn device_error(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(format!("{what}: {e}"))
}
