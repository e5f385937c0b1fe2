// The KV cache at attention_mode 1 and 2: KEY_INT8 (VALUE_INT8) keeps the keys (values) as int8
// codes, four to a uint, lowest byte first, with one float scale per [kv_heads, capacity] row:
// value = code * scale. Element e of the cache is byte e % 4 of word e / 4.

float code_at(uint word, uint byte_index) {
    return float(bitfieldExtract(int(word), int(8u * byte_index), 8));
}

vec4 codes4(uint word) {
    int w = int(word);
    return vec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8), bitfieldExtract(w, 16, 8), bitfieldExtract(w, 24, 8));
}

// Four values coded with `inverse` = 1 / scale, rounded half to even as the CPU backend does.
uint pack_codes(vec4 x, float inverse) {
    ivec4 c = ivec4(clamp(roundEven(x * inverse), -127.0, 127.0));
    return uint((c.x & 255) | ((c.y & 255) << 8) | ((c.z & 255) << 16) | ((c.w & 255) << 24));
}
