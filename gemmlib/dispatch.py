"""The dispatch layer's names, where the course, the scripts and the tests know them.

The layer itself is :mod:`gemmlib.runtime`, one job a module:

* :mod:`gemmlib.runtime.select`   which spec runs a problem (``auto``'s choice per shape,
  each spec built once, a choice's build for another layout, output type or a bias);
* :mod:`gemmlib.runtime.plans`    a spec's launch for one shape (:class:`Plan`);
* :mod:`gemmlib.runtime.compile`  its machine code, compiled once and cached on disk;
* :mod:`gemmlib.runtime.launch`   parameters packed once, one driver call per launch
  (workspaces, tensor maps, the simulator's launch);
* :mod:`gemmlib.runtime.calls`    the entry: ``prepare`` -> ``run``, and the calls the
  front ends remember (:data:`CALLS`);
* :mod:`gemmlib.runtime.driver` and :mod:`gemmlib.runtime.memory`: the driver's entry
  points, device memory and streams.

Import from there in new code; this module only hands those names on.
"""

from gemmlib.runtime.caches import STATS  # noqa: F401
from gemmlib.runtime.calls import (CALLS, cache_info, clear_memory_caches,  # noqa: F401
                                   warm)
from gemmlib.runtime.compile import (Compiled, cache_dir, cache_key, compiled,  # noqa: F401
                                     compiled_spec, machine_code, source_digest)
from gemmlib.runtime.driver import CudaError, driver  # noqa: F401
from gemmlib.runtime.launch import (SCRATCH_BYTES, TMA_DTYPE, bound, launch, run,  # noqa: F401
                                    run_rounded)
from gemmlib.runtime.memory import stream_handle  # noqa: F401
from gemmlib.runtime.plans import Plan, plan  # noqa: F401
from gemmlib.runtime.select import (AUTO, AUTO_RUNG, AUTO_SHAPE, HOPPER_AUTO,  # noqa: F401
                                    HOPPER_BM64_MMAX, HOPPER_BM64_MMAX_NARROW, HOPPER_OUT16,
                                    HOPPER_SPLIT, HOPPER_SWAP, HOPPER_SWAP_KT,
                                    HOPPER_SWAP_MMAX, HOPPER_TF32, HOPPER_TF32_FILL, OUT16_RUNGS,
                                    SKINNY_FP32_MMAX, SKINNY_MMAX, SKINNY_RUNG, SM75_AUTO,
                                    SPLIT_RUNG, TC_AUTO, TC_RUNGS, build, get_spec,
                                    resident_blocks, rung_of, select, select_batched,
                                    select_hopper, select_out, select_skinny, select_swap,
                                    select_tc,
                                    skinny_limit, tc_tuning_key, with_a_layout, with_bias,
                                    with_layout, with_out)
