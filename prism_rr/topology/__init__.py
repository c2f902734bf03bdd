"""The shape of a job: its device mesh and the roles of its ranks, the cost model of its
network, and `scale`, which writes a bundle of the same job at another size.

Reads bundles through `prism_rr.format`; imports neither torch nor a UI library.
"""
