"""The recurrences of hybrid models' layers as etmlx traces them, in place of the
functions of transformers' modeling modules that torch.export cannot keep for a call
of a length it does not know (``recurrent_kernels``, while probing and tracing):

- the gated delta rule (Qwen3.5, Qwen3-Next: ``torch_chunk_gated_delta_rule``, a loop
  over chunks) becomes one ``etmlx::gated_delta`` call, which lowering turns into
  ``mx.fast.gated_delta_update``; its state is kept in MLX's layout (B, Hv, Dv, Dk);
- the state-space scan of Mamba2 layers (``mamba2_chunk_scan``, which pads every call
  to chunks of 256 tokens) becomes the same scan over the call's own tokens, as one
  block of its quadratic form: no padding, so a decode step costs one token's work;
- Mamba (v1) mixers (Mamba, Falcon-Mamba, Jamba) run ``selective_scan_mixer``: their
  sequence path, whose scan transformers starts from zeros, as one
  ``etmlx::selective_scan`` from the layer's stored state, so a later chunk of a long
  prompt and a decode step continue where the last call ended.
"""

import contextlib
import sys

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from etmlx.lowering import custom_ops  # noqa: F401  (registers torch.ops.etmlx.gated_delta, selective_scan)

from .traced_call import TRACING


def gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` (and its one-token twin) as one
    ``etmlx::gated_delta`` call: the same normalizations in float32, the decay made
    linear, the state in MLX's layout (B, Hv, Dv, Dk)."""
    dtype = query.dtype
    query, key, value, g, beta = (x.float() for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query / query.shape[-1] ** 0.5
    if initial_state is None:
        batch, _, heads, value_size = value.shape
        initial_state = value.new_zeros(batch, heads, value_size, key.shape[-1])
    output, state = torch.ops.etmlx.gated_delta(query, key, value, g.exp(), beta, initial_state.float())
    return output.to(dtype), state if output_final_state else None


def _l2norm(x, eps: float = 1e-6):
    """transformers' (and FLA's) l2norm of the gated delta rule."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def state_space_scan(hidden_states, dt, A, B, C, chunk_size: int = 256, D=None, dt_bias=None, initial_states=None,
                     dt_softplus: bool = False, dt_limit=(0.0, float("inf")), return_final_states: bool = False,
                     **kwargs):
    """transformers' ``mamba2_chunk_scan`` over the call's L tokens as one block (the
    scan's quadratic form, with its stable segment sums), from ``initial_states`` (from
    zeros where the traced call starts a sequence: ``_from_stored``): hidden_states (B, L, H, P), dt
    (B, L, H), A (H), B and C (B, L, G, N); the output (B, L, H, P) in float32 and, with
    ``return_final_states``, the state (B, H, P, N)."""
    heads = hidden_states.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    B, C = (t.float().repeat_interleave(heads // t.shape[2], dim=2).transpose(1, 2) for t in (B, C))  # (B, H, L, N)
    log_decay = (A.float() * dt).transpose(1, 2)  # (B, H, L)
    inputs = (x * dt[..., None]).transpose(1, 2)  # (B, H, L, P)
    length = x.shape[1]
    order = torch.arange(length)
    causal = order[:, None] >= order[None, :]
    spans = _segment_sums(log_decay, order)  # (B, H, L, L): decay from token j to token i
    mixing = torch.where(causal, torch.exp(torch.where(causal, spans, 0.0)), 0.0) * (C @ B.transpose(-1, -2))
    output = mixing @ inputs
    since_start = torch.cumsum(log_decay, dim=-1)
    state = torch.zeros(x.shape[0], heads, x.shape[3], B.shape[-1]) if initial_states is None else initial_states.float()
    output = output + torch.exp(since_start)[..., None] * _from_stored(C @ state.transpose(-1, -2))
    if D is not None:
        output = output + D.float()[:, None, None] * x.transpose(1, 2)
    output = output.transpose(1, 2).contiguous()
    if not return_final_states:
        return output
    # the decay from each token to the last (the last row: sliced from L - 1, which lowers
    # where an index of -1 on a dynamic axis does not)
    to_end = torch.exp(spans[..., length - 1:, :]).transpose(-1, -2)  # (B, H, L, 1)
    total = torch.exp(since_start[..., length - 1:])[..., None]  # (B, H, 1, 1)
    final = _from_stored(total * state) + (inputs * to_end).transpose(-1, -2) @ B
    return output, final


def _from_stored(term):
    """A term computed from the stored state, or zeros where the traced call starts a
    sequence (a select, so a stale state of infinities gives zeros too). The state is
    not zeroed before the scan instead: a matmul reads it besides the decay, so that
    select would not fuse, and would be one more pass over (H, P, N) floats per layer
    and step (4% of a Mamba2 decode step)."""
    continues = TRACING.continues
    return term if continues is None else torch.where(continues, term, 0.0)


def _segment_sums(log_decay, order):
    """``sums[..., i, j]``: the log-decays of tokens j+1 to i (0 on the diagonal), as
    transformers' stable ``segment_sum`` adds them (running sums of masked copies, not
    differences of one running sum); entries above the diagonal are not used."""
    length = log_decay.shape[-1]
    repeated = log_decay[..., None].expand(*log_decay.shape, length)  # [..., k, j] = a_k
    below = order[:, None] > order[None, :]
    return torch.cumsum(torch.where(below, repeated, 0.0), dim=-2)


def selective_scan_mixer(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
    """The forward of transformers' Mamba (v1) mixers (``MambaMixer``, ``FalconMambaMixer``,
    ``JambaMambaMixer``) over a ``RecurrentLayer``: the stored convolution window before the
    call's columns, the optional norms of dt, B and C (Falcon-Mamba, Jamba), then the scan
    from the stored state. (transformers masks padding only in batches of more than one
    sequence; exports are of one.)"""
    length, dtype = hidden_states.shape[1], hidden_states.dtype
    x, gate = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)  # (B, D, L) each
    window = cache_params.update_conv_state(x, self.layer_idx, conv_kernel_size=self.conv_kernel_size)  # (B, D, K + L)
    x = ACT2FN[self.activation](_causal_depthwise(window, self.conv1d, length)).transpose(1, 2)  # (B, L, D)
    time_step, B, C = torch.split(self.x_proj(x), [self.time_step_rank, self.ssm_state_size, self.ssm_state_size],
                                  dim=-1)
    if hasattr(self, "dt_layernorm"):
        time_step, B, C = self.dt_layernorm(time_step), self.b_layernorm(B), self.c_layernorm(C)
    dt = F.softplus(F.linear(time_step, self.dt_proj.weight).float() + self.dt_proj.bias.float())
    state = cache_params.get_recurrent_state(self.layer_idx, state_idx=0)
    if state is None:  # (transformers' lazily allocating cache, while probing)
        state = x.new_zeros(x.shape[0], x.shape[2], self.ssm_state_size, dtype=torch.float32)
    output, final = torch.ops.etmlx.selective_scan(x.float(), dt, -torch.exp(self.A_log.float()), B.float(), C.float(),
                                                   state.float())
    cache_params.update_recurrent_state(final, self.layer_idx)
    output = (output + x.float() * self.D.float()) * F.silu(gate.transpose(1, 2).float())
    return self.out_proj(output.to(dtype))


def _causal_depthwise(window, conv, length: int):
    """``conv`` (a depthwise Conv1d of K taps) over the last ``length`` columns of
    ``window`` (B, D, K + length), as K shifted products: MLX's CPU convolution, compiled
    into a decode step, rounds differently from one trace to the next (a Mamba step's
    logits moved by ~2e-6 between loads of one program); products and sums do not."""
    weight = conv.weight[:, 0].to(window.dtype)  # (D, K)
    taps = weight.shape[-1]
    start = window.shape[-1] - length - taps + 1
    output = sum(window[..., start + k:start + k + length] * weight[:, k, None] for k in range(taps))
    return output if conv.bias is None else output + conv.bias.to(window.dtype)[:, None]


# The modeling modules' recurrence functions ``recurrent_kernels`` replaces, by name.
_REPLACEMENTS = {
    "torch_chunk_gated_delta_rule": gated_delta_rule,
    "torch_recurrent_gated_delta_rule": gated_delta_rule,
    "mamba2_chunk_scan": state_space_scan,
}
# The modeling modules' classes whose forward ``recurrent_kernels`` replaces, by name.
_FORWARDS = {
    "MambaMixer": selective_scan_mixer,
    "FalconMambaMixer": selective_scan_mixer,
    "JambaMambaMixer": selective_scan_mixer,
}


@contextlib.contextmanager
def recurrent_kernels(model):
    """While in the block, ``model``'s recurrent layers compute their recurrence as
    ``_REPLACEMENTS`` does. No-op for a model without them."""
    module = sys.modules[type(model).__module__]
    replaced = {name: getattr(module, name) for name in _REPLACEMENTS if hasattr(module, name)}
    classes = {getattr(module, name): forward for name, forward in _FORWARDS.items() if hasattr(module, name)}
    forwards = {cls: cls.forward for cls in classes}
    for name in replaced:
        setattr(module, name, _REPLACEMENTS[name])
    for cls, forward in classes.items():
        cls.forward = forward
    try:
        yield
    finally:
        for name, function in replaced.items():
            setattr(module, name, function)
        for cls, forward in forwards.items():
            cls.forward = forward
