"""The dashboard's pages, one module each; every module lists its routes in ``ROUTES``."""
