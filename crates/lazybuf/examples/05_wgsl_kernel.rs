//! 05: a kernel of your own on lazybuf's queue: a WGSL compute shader (wgpu: Vulkan, Metal or
//! DirectX 12) writes a buffer's device copy through its raw `wgpu::Buffer`, and the host
//! reads the result. lazybuf's later copies run on the same queue, so they follow the shader.
//!
//! Run: `cargo run --features wgpu --example 05_wgsl_kernel` (needs a Vulkan, Metal or DX12
//! adapter; Mesa's lavapipe runs it on the CPU).

use lazybuf::backend::wgpu::wgpu;
use lazybuf::backend::{RawDevice, RawMemory};
use lazybuf::{BufferState, Result, UnifiedBuffer};

const SHADER: &str = r#"
@group(0) @binding(0) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn scale_add(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&x)) {
        x[id.x] = x[id.x] * 2.0 + 1.0;
    }
}
"#;

fn main() -> Result<()> {
    let device = lazybuf::select_device("wgpu")?;
    // SAFETY: the handles are borrowed from `device`, which lives until the end of main.
    let RawDevice::Wgpu { device: gpu, queue } = (unsafe { device.raw() }) else {
        unreachable!("select_device(\"wgpu\") returns a wgpu device");
    };
    // SAFETY: as above: the pointers come from the live device.
    let (gpu, queue) = unsafe { (&*gpu, &*queue) };
    let module = gpu.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("scale_add"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = gpu.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("scale_add"),
        compilation_options: Default::default(),
        cache: None,
    });

    let n = 4096usize;
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut buf = UnifiedBuffer::from_slice(&input, &device)?;
    {
        // A device write: uploads the host data first, then the host copy is stale.
        let view = buf.device_mut()?;
        // SAFETY: the wgpu::Buffer lives as long as the view, which outlives its use below.
        let RawMemory::Wgpu(raw) = (unsafe { view.raw() }) else { unreachable!("a wgpu device") };
        // SAFETY: as above.
        let buffer = unsafe { &*raw };
        let group = gpu.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry { binding: 0, resource: buffer.as_entire_binding() }],
        });
        let mut encoder = gpu.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups((n as u32).div_ceil(64), 1, 1);
        }
        queue.submit([encoder.finish()]);
    }
    assert_eq!(buf.state(), BufferState::DeviceDirty);
    let downloaded = {
        let host = buf.host()?;
        assert!(host.iter().enumerate().all(|(i, &x)| x == i as f32 * 2.0 + 1.0));
        println!("{device}: x[10] = {} (2 * 10 + 1)", host[10]);
        buf.transfer_stats().device_to_host.bytes
    };
    println!("{downloaded} bytes downloaded, once");
    Ok(())
}
