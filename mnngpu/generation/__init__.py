"""Generation strategies over a forward() callable: autoregressive, lookahead and EAGLE
(`factory.create_strategy` picks one by speculative_type)."""
