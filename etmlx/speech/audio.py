"""Audio in: WAV files read with the standard library's ``wave`` (integer PCM, 8 to 32
bits, any rate and channel count), mixed to mono and resampled to the model's rate."""

import math
import wave

import numpy as np

from etmlx.errors import EtMlxError


class AudioError(EtMlxError, ValueError):
    """Audio that cannot be read or used: not a WAV file, an encoding ``wave`` does not
    read, no samples."""


def read_wav(path) -> tuple:
    """``(samples, rate)``: the file's channels averaged into one, as float32 in [-1, 1]."""
    try:
        with wave.open(str(path), "rb") as audio:
            channels, width, rate = audio.getnchannels(), audio.getsampwidth(), audio.getframerate()
            frames = audio.readframes(audio.getnframes())
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file") from None
    except (wave.Error, EOFError) as error:
        raise AudioError(f"{path}: not a WAV file of integer PCM samples ({error}); convert it first, for example "
                         "`ffmpeg -i IN -ac 1 -ar 16000 OUT.wav`") from None
    except OSError as error:
        raise AudioError(f"{path}: cannot be read ({error.strerror or error})") from None
    count = len(frames) // (width * channels)
    if count == 0:
        raise AudioError(f"{path}: holds no samples")
    return _to_float(frames[:count * width * channels], width).reshape(count, channels).mean(axis=1), rate


def _to_float(frames: bytes, width: int) -> np.ndarray:
    """Little-endian PCM: 8-bit unsigned, 16-, 24- and 32-bit signed."""
    raw = np.frombuffer(frames, dtype=np.uint8)
    if width == 1:
        return (raw.astype(np.float32) - 128) / 128
    if width == 3:  # no numpy type: widen each sample to 4 bytes, its sign in the top one
        padded = np.zeros((raw.size // 3, 4), dtype=np.uint8)
        padded[:, 1:] = raw.reshape(-1, 3)
        return (padded.view("<i4")[:, 0] / float(2 ** 31)).astype(np.float32)
    if width in (2, 4):
        return (raw.view(f"<i{width}") / float(2 ** (8 * width - 1))).astype(np.float32)
    raise AudioError(f"{width * 8}-bit samples: expected 8, 16, 24 or 32-bit PCM")


def resample(samples, rate: int, to_rate: int) -> np.ndarray:
    """``samples`` at ``to_rate``: band-limited, by zero-padding or cutting the spectrum
    (Fourier resampling, as ``scipy.signal.resample`` does; the signal's ends wrap)."""
    samples = np.asarray(samples, dtype=np.float32)
    if rate == to_rate:
        return samples
    if rate <= 0:
        raise AudioError(f"a sample rate of {rate} Hz")
    count = max(1, math.floor(samples.size * to_rate / rate))
    spectrum = np.fft.rfft(samples.astype(np.float64))
    bins = count // 2 + 1
    kept = np.zeros(bins, dtype=np.complex128)
    shared = min(bins, spectrum.size)
    kept[:shared] = spectrum[:shared]
    if count % 2 == 0 and shared == bins:
        kept[-1] = kept[-1].real  # the Nyquist bin of an even length is real
    return (np.fft.irfft(kept, n=count) * (count / samples.size)).astype(np.float32)
