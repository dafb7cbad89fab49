"""The model: the transformer, its fused loss, the adaptive softmax, dropout, quantisation, and looking inside."""
