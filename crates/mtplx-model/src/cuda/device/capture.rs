//! Passes captured as CUDA graphs and replayed (`cuda/graph.rs` holds the graph itself).

use cudarc::driver::sys::CUstreamCaptureMode;

use super::{device_error, CudaDevice};
use crate::cuda::graph::Graph;
use crate::error::{ModelError, Result};

impl CudaDevice {
    /// Records the launches `body` queues (and nothing else: no copies, no waits) as a
    /// graph that replays them with one call.
    ///
    /// The stream must not be used from another thread meanwhile (whatever it queued would
    /// be recorded too): see [`CudaModel`](crate::cuda::CudaModel)'s threading rule.
    pub(crate) fn capture(&self, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.capture_as(self.programmatic, body)
    }

    /// Whether [`Self::capture_as`] may chain kernels by programmatic launch here.
    #[cfg(test)]
    pub(crate) fn kernels_wait(&self) -> bool {
        self.kernels_wait
    }

    /// [`Self::capture`], its kernels chained by programmatic launch where `programmatic`
    /// (only where [`Self::kernels_wait`]).
    pub(crate) fn capture_as(
        &self,
        programmatic: bool,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<Graph> {
        assert!(
            !programmatic || self.kernels_wait,
            "kernels that do not wait, started early"
        );
        let _host = self.host_ops();
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| device_error("begin a graph capture", e))?;
        // End the capture even if `body` panics, or the stream stays unusable.
        let queued = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let graph = Graph::end_capture(&self.stream, programmatic);
        let queued = queued.unwrap_or_else(|p| std::panic::resume_unwind(p));
        queued?;
        graph?.ok_or_else(|| ModelError::Device("the graph capture recorded nothing".into()))
    }

    pub(crate) fn replay(&self, graph: &Graph) -> Result<()> {
        graph.launch()
    }
}
