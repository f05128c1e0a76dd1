"""HF reference helpers for the Gemma 4 vision and audio towers (tests only; torch inside)."""
