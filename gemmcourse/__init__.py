"""The course's helpers: figures, tables and notebook plumbing for the book.

``gemmlib`` is the library a standalone user imports (kernels, dispatch,
``matmul``, verification, benchmarks).  Everything here exists to teach it:
the figures drawn from the kernels' own index functions (``viz*``), the
notebooks' set-up and tables (``notebook``), the figures drawn from committed
result files (``plot``, ``python -m gemmcourse plot``), and the probes the
chapters run (``hopper_probe``, ``mma_roof``).

The dependency goes one way: the course imports the library, never the
reverse (``tests/test_imports.py`` checks it).
"""
