"""Who did something: the actor recorded on every event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    from .models import Agent


class ActorType(models.TextChoices):
    AGENT = "agent"
    USER = "user"
    SYSTEM = "system"


@dataclass(frozen=True, kw_only=True)
class Actor:
    type: ActorType
    id: str

    @classmethod
    def of_agent(cls, agent: Agent) -> Actor:
        return cls(type=ActorType.AGENT, id=str(agent.pk))

    @classmethod
    def of_user(cls, user: AbstractBaseUser | AnonymousUser) -> Actor:
        return cls(type=ActorType.USER, id=str(user.pk))

    @classmethod
    def system(cls, component: str) -> Actor:
        """A portal component acting on its own (a job, a command)."""
        return cls(type=ActorType.SYSTEM, id=component)
