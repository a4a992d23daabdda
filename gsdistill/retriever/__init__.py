"""Text dense retrievers (``gsdistill retriever``) trained with the shared loss core (papers 000, 001, 002, 004).

Readers (beir, tevatron, dpr) -> ``RetrievalData`` -> (label noise, mined hard negatives) ->
training groups -> ``DualEncoder`` -> ``gsdistill.losses`` by name -> evaluation (exact search +
IR metrics) -> a saved model that sentence-transformers opens.
"""
