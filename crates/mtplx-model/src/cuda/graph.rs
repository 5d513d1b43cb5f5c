//! A captured pass: the CUDA graph a stream capture recorded, instantiated. On devices of
//! sm_90 and later each edge from one kernel to the next is made programmatic before the
//! graph is instantiated (programmatic dependent launch), so a kernel's blocks are started
//! while the kernel before it finishes and wait for it inside (`GRID_WAIT` in
//! `kernels.cu`, which every kernel runs before it touches anything another kernel
//! writes): a small model's decode step is a few hundred kernels of a few microseconds, and
//! each one's start no longer waits for the last one's end to be noticed. What the kernels
//! compute, and in which order their writes are seen, does not change.
//! Only with `MTPLX_CUDA_PDL=1` for now (the model's integration tests and timings have not
//! run with it on a device yet); otherwise the edges stay as captured.

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphExec, CUgraphInstantiate_flags,
    CUgraphNode, CUgraphNodeType,
};
use cudarc::driver::{result, CudaStream, DriverError};

use super::fault::device_error;
use crate::error::{ModelError, Result};

/// An instantiated graph, launched on the stream it was captured on.
pub(crate) struct Graph {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: Arc<CudaStream>,
}

// SAFETY: CUDA graphs may be launched and destroyed from any thread, one thread at a time
// (the driver's graph thread-safety rules); a `Graph` is used through `&mut` or behind the
// model's mutex.
unsafe impl Send for Graph {}

impl Graph {
    /// Ends the capture `stream` is in and instantiates what it recorded, its kernel-to-
    /// kernel edges made programmatic where `programmatic`. `None` when nothing was recorded.
    pub(crate) fn end_capture(
        stream: &Arc<CudaStream>,
        programmatic: bool,
    ) -> Result<Option<Graph>> {
        fn wrap(what: &'static str) -> impl Fn(DriverError) -> ModelError {
            move |e| device_error(what, e)
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(wrap("bind the context"))?;
        // SAFETY: the stream is capturing (begun by the caller on this thread).
        let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }
            .map_err(wrap("end a graph capture"))?;
        if graph.is_null() {
            return Ok(None);
        }
        // Owned from here: destroyed on every path below.
        let mut out = Graph {
            graph,
            exec: std::ptr::null_mut(),
            stream: stream.clone(),
        };
        if programmatic {
            // SAFETY: `graph` is a valid graph this function owns and no one launches.
            unsafe { make_programmatic(graph) }?;
        }
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        // SAFETY: as above.
        out.exec = unsafe { result::graph::instantiate(graph, flags) }
            .map_err(wrap("instantiate a graph"))?;
        Ok(Some(out))
    }

    /// How many of the graph's edges are programmatic.
    #[cfg(test)]
    pub(crate) fn programmatic_edges(&self) -> usize {
        // SAFETY: the graph is this one's own and is not being changed.
        let (_, _, data) = unsafe { edges(self.graph) }.expect("a graph's edges");
        let programmatic = CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        data.iter().filter(|d| d.type_ == programmatic).count()
    }

    /// Queues the graph on its stream.
    pub(crate) fn launch(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_error("bind the context", e))?;
        // SAFETY: `exec` was instantiated from this graph and lives as long as `self`.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }
            .map_err(|e| device_error("launch a graph", e))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Errors at teardown have no one to go to (cudarc's own graphs record and drop them).
        // SAFETY: both handles are this graph's own, null where never made.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

/// Whether every kernel (`.entry`) of the PTX `ptx` waits for the grid before it
/// (`griddepcontrol.wait`): a source without the waits (an older one, given to
/// `MTPLX_CUDA_KERNELS`) must not have its kernels started early.
pub(crate) fn every_kernel_waits(ptx: &str) -> bool {
    let mut entries = ptx.split(".entry ").skip(1).peekable();
    entries.peek().is_some() && entries.all(|body| body.contains("griddepcontrol.wait"))
}

/// A driver call's status as a `Result`.
fn check(what: &str, status: sys::CUresult) -> Result<()> {
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(ModelError::Device(format!("{what}: {e:?}"))),
    }
}

/// Every edge of `graph`: its upstream nodes, downstream nodes and edge data.
///
/// # Safety
/// `graph` must be a valid graph that nothing else changes meanwhile.
type Edges = (Vec<CUgraphNode>, Vec<CUgraphNode>, Vec<CUgraphEdgeData>);
unsafe fn edges(graph: CUgraph) -> Result<Edges> {
    let mut count = 0usize;
    check(
        "count a graph's edges",
        sys::cuGraphGetEdges_v2(
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut count,
        ),
    )?;
    let mut from: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    let mut to: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    let mut data: Vec<CUgraphEdgeData> = vec![std::mem::zeroed(); count];
    if count > 0 {
        check(
            "read a graph's edges",
            sys::cuGraphGetEdges_v2(
                graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut count,
            ),
        )?;
    }
    from.truncate(count);
    to.truncate(count);
    data.truncate(count);
    Ok((from, to, data))
}

/// Turns every edge of `graph` from a kernel node to a kernel node into a programmatic one
/// (out of the upstream kernel's programmatic port), leaving every other edge as it was.
///
/// # Safety
/// `graph` must be a valid graph that nothing else uses meanwhile.
unsafe fn make_programmatic(graph: CUgraph) -> Result<()> {
    let (from, to, data) = edges(graph)?;
    let is_kernel = |node: CUgraphNode| -> Result<bool> {
        let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(
            "a graph node's type",
            sys::cuGraphNodeGetType(node, &mut kind),
        )?;
        Ok(kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
    };
    let programmatic = CUgraphEdgeData {
        from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
        to_port: 0,
        type_: CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    };
    for i in 0..data.len() {
        let default =
            data[i].type_ == CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8;
        if !default || !is_kernel(from[i])? || !is_kernel(to[i])? {
            continue;
        }
        check(
            "remove a graph edge",
            sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1),
        )?;
        check(
            "add a programmatic graph edge",
            sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &programmatic, 1),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::every_kernel_waits;
    use crate::cuda::switches::opted_in;

    /// Programmatic launch is kept for a PTX whose every kernel waits: one kernel without
    /// the wait (an older source) turns it off.
    #[test]
    fn only_a_source_whose_kernels_all_wait_is_launched_early() {
        let wait = "{ griddepcontrol.wait; ld.global.f32 }";
        assert!(every_kernel_waits(&format!(
            ".version 8\n.entry a(){wait}\n.entry b(){wait}"
        )));
        assert!(!every_kernel_waits(&format!(
            ".entry a(){wait}\n.entry b(){{ ld.global.f32 }}"
        )));
        assert!(!every_kernel_waits(".version 8"));
        // The built-in source, for Hopper, where NVRTC loads (CI has none; the device has).
        match crate::cuda::compile("compute_90") {
            Ok(ptx) => assert!(every_kernel_waits(&ptx), "a built-in kernel does not wait"),
            Err(e) => assert!(e.to_string().contains("not installed"), "{e}"),
        }
    }
    use crate::cuda::tests::{device, matrix, random_blocks, Rng};
    use crate::kernels::QuantFormat;

    /// A captured chain of kernels that each read what the one before wrote (a norm, then a
    /// product accumulating into the norm's input, 24 times) gives, replayed, the bits the
    /// same launches give in stream order; where the kernels wait (sm_90 and later) every
    /// edge of the chain is made programmatic (whatever `MTPLX_CUDA_PDL` says), so the kernels' waits are what
    /// orders them; and a capture with the device's own setting has them programmatic only
    /// with `MTPLX_CUDA_PDL=1`.
    #[test]
    fn a_programmatic_chain_gives_the_stream_orders_bits() {
        let Some(dev) = device() else { return };
        let mut rng = Rng(53);
        let (rows, cols, links) = (576, 576, 24);
        let bytes = random_blocks(QuantFormat::Q4_1, rows, cols, &mut rng);
        let m = matrix(&dev, QuantFormat::Q4_1, &bytes, rows, cols);
        let w: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let y0: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let wd = dev.upload(&w).unwrap();
        let mut y = dev.upload(&y0).unwrap();
        let mut z = dev.zeros::<f32>(cols).unwrap();
        let mut chain = |y: &mut cudarc::driver::CudaSlice<f32>| -> crate::error::Result<()> {
            for _ in 0..links {
                dev.rms_norm(y, &wd, &mut z, 1, cols, 1e-5)?;
                dev.matvec(&m, &z, y, 1, true)?;
            }
            Ok(())
        };
        chain(&mut y).unwrap();
        let mut want = vec![0f32; cols];
        dev.read(&y, 0, &mut want).unwrap();
        dev.write(&y0, &mut y, 0).unwrap();
        // (On sm_90 and later with the built-in kernels, which all wait.)
        let hopper = dev.kernels_wait();
        let own = dev.capture(|| chain(&mut y)).unwrap();
        let pdl = hopper && opted_in("MTPLX_CUDA_PDL");
        let kernels = 2 * links;
        assert_eq!(own.programmatic_edges(), if pdl { kernels - 1 } else { 0 });
        drop(own);
        let graph = dev.capture_as(hopper, || chain(&mut y)).unwrap();
        assert_eq!(
            graph.programmatic_edges(),
            if hopper { kernels - 1 } else { 0 }
        );
        for round in 0..3 {
            dev.write(&y0, &mut y, 0).unwrap();
            dev.replay(&graph).unwrap();
            let mut got = vec![0f32; cols];
            dev.read(&y, 0, &mut got).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "round {round}, value {i}: {a} vs {b}"
                );
            }
        }
    }
}
