"""The harness ABI (version 0) as data: the one definition host, translator and guest SDK all derive from.

See shared/ABI.md. Nothing here runs guest code; everything here is a fact of the binary contract, and of how the
text an image chose is shown (``text``: escaped, for the translator's listings and the host's messages alike).
"""
