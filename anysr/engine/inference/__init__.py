"""`anysr infer` on images (tiled) and videos (chunked), and `anysr export` (plain weights, ONNX)."""
