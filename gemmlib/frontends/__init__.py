"""gemmlib's front ends: the caller's arrays, described once per call.

``operand``        what a call knows of one array (:class:`~.operand.Operand`)
``describe``       which front end describes an array
``torch_tensors``  torch CUDA tensors: their dtypes, streams and arrays
``arrays``         CuPy, NumPy, numba, DLPack and ``__cuda_array_interface__`` arrays
``checks``         what a call may be, with errors worded in the caller's framework
``allocate``       arrays a call makes, in the caller's own type
"""
