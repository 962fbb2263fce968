"""The Python side of the guest SDK (the C side is harnesses/sdk): the guest toolchain driver (``toolchain``), the
compiler runtime every guest links (``runtime``), the cache of built guest code (``cache``), the generated
host-call header (``header``), harness.toml and the manifest (``harness_toml``, ``entry``), ``berm build``
(``build.build_harness``), bundled harnesses built on first use (``bundled.bundled_image``), and the SDK built for
the host to test tools natively (``native``)."""
