"""Data: the candidates' loaders, the teacher datasets and the training labels."""
