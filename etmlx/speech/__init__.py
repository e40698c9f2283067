"""Speech models: Whisper exported with its log-mel front end (``whisper_program``) and
transcribed window by window (``transcribe``), from WAV files (``audio``)."""
