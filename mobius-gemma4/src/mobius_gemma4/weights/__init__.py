"""Weight maps: HF checkpoint names → initializers of the Gemma 4 graphs."""
