"""The schemas of ExecuTorch's MLX delegate's custom ops (backends/mlx/custom_ops.py in
ExecuTorch's sources: names, arguments, defaults, the cache's mutation; one of its custom
Metal kernels; ExecuTorch's off-graph cache op, extension/llm/cache), defined here
because the executorch 1.5.1 wheel cannot import that module ("MLX delegate generated
files not found"). The eager kernels are this file's own reading of the ops' documented
meaning, written as plainly as possible: the references the tests hold etmlx to."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def _define():
    if hasattr(torch.ops, "mlx") and hasattr(torch.ops.mlx, "rope"):
        return  # ExecuTorch's own definitions (a source build) or ours, already loaded

    @torch.library.custom_op("mlx::kv_cache_update", mutates_args=("cache",))
    def kv_cache_update(cache: Tensor, new_values: Tensor, start_pos: int, ring_size: int = 0) -> Tensor:
        for t in range(new_values.shape[2]):
            slot = (start_pos + t) % ring_size if ring_size > 0 else start_pos + t
            cache[:, :, slot] = new_values[:, :, t]
        return torch.empty((1,), dtype=new_values.dtype)

    @kv_cache_update.register_fake
    def _(cache, new_values, start_pos, ring_size=0):
        return torch.empty((1,), dtype=new_values.dtype, device="meta")

    @torch.library.custom_op("mlx::custom_sdpa", mutates_args=())
    def custom_sdpa(query: Tensor, key: Tensor, value: Tensor, start_pos: int, attn_mask: Optional[Tensor] = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None) -> Tensor:
        stop = start_pos + query.shape[2]
        key, value = key[:, :, :stop], value[:, :, :stop]
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        if is_causal:  # query row i is at position start_pos + i
            rows = torch.arange(query.shape[2])[:, None] + start_pos
            attn_mask = torch.arange(stop)[None, :] <= rows
        return F.scaled_dot_product_attention(query, key, value, attn_mask, scale=scale)

    @custom_sdpa.register_fake
    def _(query, key, value, start_pos, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return query.new_empty(query.shape)

    @torch.library.custom_op("mlx::rope", mutates_args=())
    def rope(x: Tensor, dims: int, pos: int, traditional: bool = False, base: float = 500000.0, scale: float = 1.0,
             freqs: Optional[Tensor] = None) -> Tensor:
        half = dims // 2
        inverse = 1.0 / freqs.float() if freqs is not None else base ** (-2.0 * torch.arange(half).float() / dims)
        angles = torch.arange(pos, pos + x.shape[2]).float()[:, None] * inverse * scale
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        rotated, rest = x[..., :dims], x[..., dims:]
        if traditional:
            a, b = rotated[..., 0::2], rotated[..., 1::2]
            out = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
        else:
            a, b = rotated[..., :half], rotated[..., half:]
            out = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
        return torch.cat([out, rest], -1)

    @rope.register_fake
    def _(x, dims, pos, traditional=False, base=500000.0, scale=1.0, freqs=None):
        return x.new_empty(x.shape)

    @torch.library.custom_op("mlx::gather_mm", mutates_args=())
    def gather_mm(a: Tensor, b: Tensor, rhs_indices: Optional[Tensor] = None, lhs_indices: Optional[Tensor] = None,
                  sorted_indices: Optional[Tensor] = None) -> Tensor:
        chosen = b if rhs_indices is None else torch.stack([b[i] for i in rhs_indices.tolist()])
        return a @ chosen

    @gather_mm.register_fake
    def _(a, b, rhs_indices=None, lhs_indices=None, sorted_indices=None):
        batch = b.shape[:-2] if rhs_indices is None else rhs_indices.shape
        return a.new_empty((*batch, a.shape[-2], b.shape[-1]))

    @torch.library.custom_op("mlx::gather_qmm", mutates_args=())
    def gather_qmm(x: Tensor, w: Tensor, scales: Tensor, biases: Optional[Tensor] = None,
                   rhs_indices: Optional[Tensor] = None, lhs_indices: Optional[Tensor] = None, transpose: bool = True,
                   group_size: int = 32, bits: int = 4, mode: str = "affine",
                   sorted_indices: Optional[Tensor] = None) -> Tensor:
        """x @ w[rhs_indices] dequantized: w holds signed values (int8), or for 4 bits two
        unsigned nibbles a byte (the even value low) that are signed by subtracting 8;
        each group of ``group_size`` values of a row is ``q * scale + bias``."""
        if rhs_indices is not None:
            w, scales = w[rhs_indices], scales[rhs_indices]
            biases = None if biases is None else biases[rhs_indices]
        if w.dtype == torch.uint8:
            w = torch.stack([w & 15, w >> 4], -1).flatten(-2).to(torch.int16) - 8
        weight = w.to(x.dtype) * scales.repeat_interleave(group_size, -1)
        if biases is not None:
            weight = weight + biases.repeat_interleave(group_size, -1)
        return x @ (weight.transpose(-1, -2) if transpose else weight)

    @gather_qmm.register_fake
    def _(x, w, scales, biases=None, rhs_indices=None, lhs_indices=None, transpose=True, group_size=32, bits=4,
          mode="affine", sorted_indices=None):
        batch = w.shape[:-2] if rhs_indices is None else rhs_indices.shape
        return x.new_empty((*batch, x.shape[-2], w.shape[-2] if transpose else w.shape[-1]))

    @torch.library.custom_op("mlx::moe_gather_inputs", mutates_args=())
    def moe_gather_inputs(x: Tensor, expert_indices: Tensor, top_k: int,
                          sort_cutoff: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Each token's row once per chosen expert; past ``sort_cutoff`` tokens ordered by
        expert (then the inverse order undoes it), else in token order."""
        tokens = x.shape[0]
        flat = expert_indices.flatten()
        if tokens > sort_cutoff:
            order = flat.argsort()
            return (x[order // top_k].unsqueeze(-2), flat[order].to(torch.int32), torch.ones((), dtype=torch.int32),
                    order.argsort().to(torch.int32))
        return (x.repeat_interleave(top_k, 0).unsqueeze(-2), flat.to(torch.int32), torch.zeros((), dtype=torch.int32),
                torch.arange(tokens * top_k, dtype=torch.int32))

    @moe_gather_inputs.register_fake
    def _(x, expert_indices, top_k, sort_cutoff):
        count = x.shape[0] * top_k
        return (x.new_empty((count, 1, x.shape[-1])), expert_indices.new_empty((count,), dtype=torch.int32),
                x.new_empty((), dtype=torch.int32), x.new_empty((count,), dtype=torch.int32))

    @torch.library.custom_op("mlx::moe_scatter_outputs", mutates_args=())
    def moe_scatter_outputs(down: Tensor, sort_experts: Tensor, inv_order: Tensor, top_k: int) -> Tensor:
        down = down.squeeze(-2)
        if sort_experts.item():
            down = down[inv_order.long()]
        return down.reshape(down.shape[0] // top_k, top_k, -1).clone()

    @moe_scatter_outputs.register_fake
    def _(down, sort_experts, inv_order, top_k):
        return down.new_empty((down.shape[0] // top_k, top_k, down.shape[-1]))

    @torch.library.custom_op("mlx::sample", mutates_args=())
    def sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
               seed: Optional[Tensor] = None) -> Tensor:
        """A token id a row, by Gumbel-max over logits / temperature filtered to the top_k
        largest, then to the smallest set of those whose probability reaches top_p; the
        argmax of the logits where temperature <= 0. Its noise is torch's (upstream's
        reference is not bit-identical to its device either): the tests hold etmlx to
        its distribution, not its draws."""
        if float(temperature) <= 0:
            return logits.argmax(-1)
        scaled = logits.float() / temperature
        kth = scaled.sort(-1, descending=True).values[..., min(int(top_k), scaled.shape[-1]) - 1, None]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = scaled.softmax(-1)
        ordered = probs.sort(-1, descending=True).values
        smallest = ordered.masked_fill(ordered.cumsum(-1) - ordered > top_p, float("inf")).amin(-1, keepdim=True)
        scaled = scaled.masked_fill(probs < smallest, float("-inf"))
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        uniform = torch.rand(scaled.shape, generator=generator)
        return (scaled - (-uniform.log()).log()).argmax(-1)

    @sample.register_fake
    def _(logits, temperature, top_k, top_p, seed=None):
        return logits.new_empty(logits.shape[:-1], dtype=torch.long)


    @torch.library.custom_op("mlx::tq_norm", mutates_args=())
    def tq_norm(x: Tensor) -> Tensor:
        """One of the upstream delegate's custom Metal kernels (custom_kernel_ops/): the
        L2 norm of the last axis."""
        return torch.linalg.vector_norm(x, dim=-1, keepdim=True).to(x.dtype)

    @tq_norm.register_fake
    def _(x):
        return x.new_empty((*x.shape[:-1], 1))

    @torch.library.custom_op("mlx::gated_delta_rule", mutates_args=("state",))
    def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                         use_custom_kernel: bool = True) -> Tensor:
        """backends/mlx/custom_kernel_ops/gated_delta_rule.py: per step, the state
        [B, Hv, Dv, Dk] decays by g, moves towards v along k by beta, and is read by q;
        value head h reads key head h // (Hv / Hk); the final state is written to ``state``."""
        repeat = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(repeat, 2), k.repeat_interleave(repeat, 2)
        s, outputs = state.clone(), []
        for t in range(q.shape[1]):
            s = s * g[:, t, :, None, None]
            delta = (v[:, t] - (s * k[:, t, :, None, :]).sum(-1)) * beta[:, t, :, None]
            s = s + k[:, t, :, None, :] * delta[..., None]
            outputs.append((s * q[:, t, :, None, :]).sum(-1))
        state.copy_(s)
        return torch.stack(outputs, 1)

    @gated_delta_rule.register_fake
    def _(q, k, v, g, beta, state, use_custom_kernel=True):
        return v.new_empty(v.shape)

    @torch.library.custom_op("kvcache::update_and_attend", mutates_args=())
    def update_and_attend(q: Tensor, k: Tensor, v: Tensor, position: Tensor, layer_id: int, scale: float,
                          out_dtype: torch.dtype) -> Tensor:
        """ExecuTorch's off-graph cache op (extension/llm/cache): appends k and v to the
        cache installed for ``layer_id`` in a process-wide registry, then attends. No
        cache is installed here, as upstream's kernel says with none active."""
        raise RuntimeError("update_and_attend called with no active cache")

    @update_and_attend.register_fake
    def _(q, k, v, position, layer_id, scale, out_dtype):
        return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype)


_define()
