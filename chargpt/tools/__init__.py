"""The tools beside training and sampling: evaluation, export (a Hugging Face folder or a web page), and novelty."""
