"""gemmlib's runtime: what a call needs below the framework front ends, one job a module.

``calls``    the entry: a product prepared once (``prepare`` -> ``Call``), then ``run``
``select``   which spec runs a problem (each spec built once; ``auto``'s choice per shape)
``plans``    a spec's launch for one shape (``Plan``)
``compile``  machine code, compiled once and cached on disk, loaded per context
``launch``   parameters packed once, one driver call per launch; workspaces; the
             simulator's launch
``maps``     a call's tensor maps in device memory, kept, written on its stream
``caches``   the counters, the lock and the bounded tables the others remember with
``driver``   the CUDA driver entry points (ctypes): launches, device, capture state
``memory``   device memory, streams and CUDA-graph capture rules for workspaces
"""
