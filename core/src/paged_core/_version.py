"""The distribution's version: the one place it is written (``pyproject.toml`` reads it from here).

paged-core ``0.N.M`` implements plugin API ``N`` (:data:`paged_core.contract.version.PLUGIN_API_VERSION`,
a meta-test keeps the two equal); ``M`` counts releases within that API.
"""

__version__ = "0.1.0"
