"""Model pairs: loading any Hugging Face draft/target pair, and building the offline default."""
