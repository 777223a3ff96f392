"""The live measurer: the search's measurer on this machine (``LiveMeasurer``), the parent's side of its
workers, their pool, the environments' process pairs and their factors, and a candidate being measured.
"""
