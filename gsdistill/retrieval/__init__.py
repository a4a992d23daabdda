"""Retrieval: IR metrics, exact inner-product search, page-retrieval evaluation."""
