"""Serving: score (query, passage) pairs with an exported or Hugging Face student.

It imports only the ground floor (:mod:`distill.core`): no lightning, datasets, teachers, students or
export code; torch and onnxruntime are imported by the scorer that needs them.
"""
