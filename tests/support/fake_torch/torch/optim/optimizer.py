"""Stand-in for torch.optim.optimizer (see torch/__init__.py)."""
_post_hooks = []


def register_optimizer_step_post_hook(hook):
    import torch
    torch._log("register_optimizer_step_post_hook")
    _post_hooks.append(hook)


class SGD:
    def step(self):
        for hook in _post_hooks:
            hook(self, (), {})
