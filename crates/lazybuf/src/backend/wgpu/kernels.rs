//! lazybuf's own compute shaders: filling a buffer with a pattern, and writing a buffer's last
//! partial word.
//!
//! wgpu copies and clears whole 4-byte words only, while lazybuf's buffers may end mid-word
//! (seven `u8`s). The last word of such a transfer is *merged*: the shader writes only the
//! bytes the operation covers (`last_mask`) and keeps the others, so no byte beyond an
//! operation's length changes.
//!
//! Storage bindings are limited in size (`max_storage_buffer_binding_size`, 128 MiB on
//! lavapipe) and must start at a multiple of `min_storage_buffer_offset_alignment`, so long
//! fills run in chunks that start at multiples of [`CHUNK_ALIGN`] bytes; a pattern repeats every
//! 16 bytes, so every chunk starts at the pattern's start. Each dispatch covers its words with
//! a grid-stride loop, so no dispatch exceeds the workgroup-count limit.

use std::num::NonZeroU64;

use wgpu::util::DeviceExt;

const SHADER: &str = r#"
struct Params {
    start: u32,      // the first word written, counted from the start of the `dst` binding
    count: u32,      // the number of words written
    last_mask: u32,  // the bits of the last word that are written (the rest are kept)
    src_start: u32,  // merge: the source word, counted from the start of the `src` binding
    pattern: vec4<u32>,
}

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> src: array<u32>;

const GROUP: u32 = 64u;

@compute @workgroup_size(64)
fn fill(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * GROUP;
    for (var i = id.x; i < params.count; i += stride) {
        let value = params.pattern[i & 3u];
        let at = params.start + i;
        if (i + 1u == params.count) {
            dst[at] = (dst[at] & ~params.last_mask) | (value & params.last_mask);
        } else {
            dst[at] = value;
        }
    }
}

@compute @workgroup_size(1)
fn merge() {
    let at = params.start;
    dst[at] = (dst[at] & ~params.last_mask) | (src[params.src_start] & params.last_mask);
}
"#;

/// Chunks of a long fill start at multiples of this many bytes (every storage offset
/// alignment wgpu allows divides it, and so does the pattern's 16-byte period).
pub(super) const CHUNK_ALIGN: u64 = 256;

/// The two pipelines, made once per device.
#[derive(Debug)]
pub(super) struct Kernels {
    fill: wgpu::ComputePipeline,
    merge: wgpu::ComputePipeline,
    /// The longest binding, in bytes (a multiple of [`CHUNK_ALIGN`]).
    max_binding: u64,
    max_groups: u32,
}

/// The bits of a word that its first `bytes` bytes (1 to 4) occupy, little-endian.
pub(super) fn mask(bytes: usize) -> u32 {
    if bytes >= 4 { u32::MAX } else { (1u32 << (8 * bytes)) - 1 }
}

/// Up to four bytes as a little-endian word (missing bytes are zero).
pub(super) fn word(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word[..bytes.len().min(4)].copy_from_slice(&bytes[..bytes.len().min(4)]);
    u32::from_le_bytes(word)
}

impl Kernels {
    /// Compiles the shader for `device` (inside the caller's error scope).
    pub(super) fn new(device: &wgpu::Device) -> Kernels {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("lazybuf kernels"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("lazybuf kernel"),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        };
        let limits = device.limits();
        Kernels {
            fill: pipeline("fill"),
            merge: pipeline("merge"),
            max_binding: (limits.max_storage_buffer_binding_size.min(1 << 30) / CHUNK_ALIGN * CHUNK_ALIGN)
                .max(CHUNK_ALIGN),
            max_groups: limits.max_compute_workgroups_per_dimension.max(1),
        }
    }

    /// Records a fill of the first `words` words of `dst` with the 16-byte `pattern` (as four
    /// words), writing only the `last_mask` bits of the last word.
    pub(super) fn fill(
        &self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        words: u64,
        pattern: [u32; 4],
        last_mask: u32,
    ) {
        let total = words * 4;
        let mut offset = 0;
        while offset < total {
            let size = self.max_binding.min(total - offset);
            let count = size / 4;
            let last = if offset + size == total { last_mask } else { u32::MAX };
            let params = params(0, count as u32, last, 0, pattern);
            let groups = count.div_ceil(64).clamp(1, self.max_groups.into()) as u32;
            self.dispatch(device, encoder, &self.fill, &params, (dst, offset, size), None, groups);
            offset += size;
        }
    }

    /// Records a write of the word at byte `at` of `dst` (a multiple of 4): the `last_mask`
    /// bits of `value`, the others kept.
    pub(super) fn patch(
        &self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        at: u64,
        value: u32,
        last_mask: u32,
    ) {
        let base = at / CHUNK_ALIGN * CHUNK_ALIGN;
        let start = ((at - base) / 4) as u32;
        let params = params(start, 1, last_mask, 0, [value; 4]);
        self.dispatch(device, encoder, &self.fill, &params, (dst, base, at + 4 - base), None, 1);
    }

    /// Records a copy of the `last_mask` bits of the word at byte `at` of `src` into the same
    /// word of `dst` (the other bits of `dst` kept).
    pub(super) fn merge(
        &self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        at: u64,
        last_mask: u32,
    ) {
        let base = at / CHUNK_ALIGN * CHUNK_ALIGN;
        let start = ((at - base) / 4) as u32;
        let params = params(start, 1, last_mask, start, [0; 4]);
        let range = at + 4 - base;
        self.dispatch(device, encoder, &self.merge, &params, (dst, base, range), Some((src, base, range)), 1);
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        pipeline: &wgpu::ComputePipeline,
        params: &[u8],
        dst: (&wgpu::Buffer, u64, u64),
        src: Option<(&wgpu::Buffer, u64, u64)>,
        groups: u32,
    ) {
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("lazybuf kernel parameters"),
            contents: params,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        fn binding<'a>((buffer, offset, size): (&'a wgpu::Buffer, u64, u64)) -> wgpu::BindingResource<'a> {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset, size: NonZeroU64::new(size) })
        }
        let mut entries = vec![
            wgpu::BindGroupEntry { binding: 0, resource: binding(dst) },
            wgpu::BindGroupEntry { binding: 1, resource: uniform.as_entire_binding() },
        ];
        if let Some(src) = src {
            entries.push(wgpu::BindGroupEntry { binding: 2, resource: binding(src) });
        }
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("lazybuf kernel bindings"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("lazybuf kernel"),
            timestamp_writes: None,
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    }
}

/// The shader's `Params`, as the bytes of its uniform buffer.
fn params(start: u32, count: u32, last_mask: u32, src_start: u32, pattern: [u32; 4]) -> Vec<u8> {
    [start, count, last_mask, src_start].iter().chain(pattern.iter()).flat_map(|w| w.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_words_are_little_endian() {
        assert_eq!(mask(1), 0xff);
        assert_eq!(mask(3), 0x00ff_ffff);
        assert_eq!(mask(4), u32::MAX);
        assert_eq!(word(&[1, 2, 3]), 0x0003_0201);
        assert_eq!(params(1, 2, 3, 4, [5, 6, 7, 8]).len(), 32);
    }
}
