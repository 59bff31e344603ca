"""Export backends: a student's HF folder to ONNX (fp32, fp16, int8) and TorchScript files, checked for parity.

Isolated from the rest of the project, and light to import: torch, onnx and onnxruntime are imported by
the functions that use them.
"""

from distill.backend.export import ExportReport, export_student
from distill.backend.parity import ParityError, ParitySet, verify_export

__all__ = ["ExportReport", "ParityError", "ParitySet", "export_student", "verify_export"]
