"""Guess the sum (a verifiers v1 taskset and env): the task's prompt is "a+b="; a wrong answer gets "higher" or
"lower" and the question again, up to 3 answers; the reward is 1 when the last answer is the sum, else 0."""

import verifiers.v1 as vf

MAX_ANSWERS = 3


class SumData(vf.TaskData):
    total: int


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        replies = [m.content for m in trace.assistant_messages]
        return 1.0 if replies and replies[-1].strip() == str(self.data.total) else 0.0


class SumConfig(vf.TasksetConfig):
    n: int = 24  # tasks: a+b for a = 0..n-1, b = a % 5


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for a in range(self.config.n):
            b = a % 5
            yield SumTask(SumData(idx=a, prompt=f"{a}+{b}=", total=a + b))


class SumEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as game:
            segment = await game.turn()
            for _ in range(MAX_ANSWERS - 1):
                text = (segment.last_reply or "").strip()
                if text == str(task.data.total):
                    return
                hint = "lower" if text.isdigit() and int(text) > task.data.total else "higher"
                segment = await game.turn(f"{hint}\n{task.data.prompt_text}")


__all__ = ["SumTaskset", "SumEnv"]
