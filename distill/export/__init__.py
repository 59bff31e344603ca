"""Export backends: a student's HF folder to ONNX (fp32, fp16, int8) and TorchScript files, checked for parity.

Import what you need from its modules (:mod:`distill.export.exporter`, :mod:`distill.export.parity`); this
package imports nothing itself, so serving code never pulls in the exporters.
"""
