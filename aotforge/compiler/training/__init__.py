"""Training-side compression of a causal LM before it compiles: knowledge distillation into a smaller student
(a draft for speculative decoding first of all). Writes a transformers directory that ``aotforge compile`` takes."""
