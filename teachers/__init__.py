"""Teacher scorers: causal LMs that judge (query, passage) pairs by CIS and its ablations."""

from teachers.teacher import CausalLMTeacher
from teachers.terms import SCORES, ScoreDefinition, required_terms

__all__ = ["SCORES", "CausalLMTeacher", "ScoreDefinition", "required_terms"]
