"""Pre-tokenizer patterns that the text formats imply but do not store."""

# Qwen's split: the pattern of tiktoken-based Qwen models (type 1) and the one MNN's type 3 reader
# hard-codes (there with ASCII-only letter and digit classes; here with Unicode ones, as the
# source tokenizers have it).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
