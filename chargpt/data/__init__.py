"""The data: the vocabulary, corpora on disk and their batches, sentence pairs, item lists, labels, downloads."""
