"""Whisper's log-mel spectrogram as a traceable module: what ``WhisperFeatureExtractor``
computes from one window of 16 kHz samples, in MLX operations.

The short-time Fourier transform is a matrix product: the frames (the samples padded by
reflection at both ends, as ``torch.stft(center=True)`` pads them, cut ``hop_length`` apart)
times the Hann-windowed cosine and sine of each frequency bin. Frames are cut without a
strided view: the padded signal, reshaped into rows of ``hop_length`` samples, holds frame
``t`` as rows ``t, t+1, ...`` laid end to end, so the frames are a concatenation of
shifted slices (exact, and every piece of it an op both runtimes run)."""

import math

import torch
from torch import nn


class LogMel(nn.Module):
    """``samples [window_samples] -> features [1, n_mels, frames]`` (float32)."""

    def __init__(self, mel_filters, n_fft: int = 400, hop_length: int = 160, window_samples: int = 480000):
        super().__init__()
        filters = torch.as_tensor(mel_filters, dtype=torch.float32)  # [n_fft // 2 + 1, n_mels], as the extractor
        if filters.shape[0] != n_fft // 2 + 1:
            raise ValueError(f"mel filters of {tuple(filters.shape)} do not fit n_fft={n_fft}")
        self.n_fft, self.hop_length, self.window_samples = n_fft, hop_length, window_samples
        self.frames = window_samples // hop_length  # the extractor drops the STFT's last frame
        self.register_buffer("mel_filters", filters, persistent=False)
        self.register_buffer("fourier", _windowed_fourier_basis(n_fft), persistent=False)

    def forward(self, samples):
        half = self.n_fft // 2
        padded = torch.cat([samples[1:half + 1].flip(0), samples, samples[-half - 1:-1].flip(0)])
        rows_needed = self.frames + math.ceil(self.n_fft / self.hop_length)
        padded = torch.cat([padded, padded.new_zeros(rows_needed * self.hop_length - padded.shape[0])])
        rows = padded.reshape(rows_needed, self.hop_length)
        pieces, left = [], self.n_fft
        for shift in range(math.ceil(self.n_fft / self.hop_length)):
            width = min(left, self.hop_length)
            pieces.append(rows[shift:shift + self.frames, :width])
            left -= width
        frames = torch.cat(pieces, dim=1)  # [frames, n_fft]
        spectrum = frames @ self.fourier  # [frames, 2 * bins]: cosine parts, then sine parts
        bins = self.n_fft // 2 + 1
        power = spectrum[:, :bins] ** 2 + spectrum[:, bins:] ** 2
        mel = power @ self.mel_filters  # [frames, n_mels]
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return ((log_spec + 4.0) / 4.0).transpose(0, 1).unsqueeze(0)


def _windowed_fourier_basis(n_fft: int):
    """``[n_fft, 2 * (n_fft // 2 + 1)]``: a periodic Hann window times the cosine and sine
    of every bin, computed in float64 and rounded once."""
    time = torch.arange(n_fft, dtype=torch.float64)
    window = 0.5 - 0.5 * torch.cos(2 * math.pi * time / n_fft)
    angle = 2 * math.pi * time[:, None] * torch.arange(n_fft // 2 + 1, dtype=torch.float64)[None, :] / n_fft
    return torch.cat([window[:, None] * torch.cos(angle), window[:, None] * torch.sin(angle)], dim=1).float()
