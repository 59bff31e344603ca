"""Teacher scorers: causal LMs that judge (query, passage) pairs by CIS and its ablations."""

from teachers.scores import SCORES, ScoreDefinition, required_terms
from teachers.teacher import CausalLMTeacher

__all__ = ["SCORES", "CausalLMTeacher", "ScoreDefinition", "required_terms"]
