"""The paths a call can take, each one beside the others (:func:`gemmlib.matmul` picks):

``product``  one 2-D product whose spec is chosen, on the operands where they lie
``batched``  a batch of 16-bit products as one launch
``fp8``      FP8 products with per-tensor scales
``repeat``   calls already checked: the short paths (torch tensors as they come, too)
"""
