"""The JAX layer: kernels and captured graphs inside ``jax.jit``, and everything built on replay.

``kernel_call.py`` lowers :meth:`Kernel.jax_call <jaxgraph.Kernel.jax_call>`;
replay inside jit is ``replayable.py`` (the user contract), ``replay_spec.py``
(what a build settles and what crosses the native boundary) and
``replay_native.py`` (the FFI call and the native graph table);
``host_callback.py`` is the ``jax.pure_callback`` path. On replay stand
graphed callables, graphed loops and several devices and processes.
"""
