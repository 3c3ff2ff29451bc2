"""What a profiler puts on the model for a step and takes off again: hooks, TE interception, the dispatch mode."""

from __future__ import annotations

from te_gemm_callback.capture.graphs import EagerForwards
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.scope import ModuleScope
from te_gemm_callback.capture.steady import EagerCompiled
from te_gemm_callback.capture.te_adapter import TEInterceptor
from te_gemm_callback.capture.torch_adapter import GemmDispatchMode


class Instruments:
    """The instruments of one profiler, attached in one of three modes (:meth:`attach`)."""

    def __init__(self, scope: ModuleScope, recorder: Recorder, te: TEInterceptor | None) -> None:
        self.scope, self.recorder, self.te = scope, recorder, te
        self.attached: str | None = None  # None, or the mode of attach()
        self.mode: GemmDispatchMode | None = None  # the torch dispatch mode while it is on
        self.paused_mode = False  # the dispatch mode was on when the job paused (pause/resume)
        self.eager = EagerForwards({})  # graphed modules: their eager forward on instrumented steps
        self.eager_compiled = EagerCompiled({})  # likewise compiled ones

    def attach(self, mode: str) -> None:
        """Hooks and TE interception. "full": every module hooked; "te": only the TE modules that own GEMMs;
        "order": no hooks, TE GEMM owners by launch order from an earlier hooked step."""
        if self.attached is not None and self.attached != mode:
            self.scope.detach()
            self.attached = None
        # Graph replays and compiled code run none of our hooks: instrumented steps run eager forwards.
        self.eager.enter()
        self.eager_compiled.enter()
        if self.attached is None:
            if mode != "order":
                self.scope.attach(None if mode == "full" else self.scope.te_gemm_set)
            self.attached = mode
            if self.te is not None and not self.te.installed:
                try:
                    self.te.install()
                except Exception:
                    self.scope.detach()
                    self.attached = None
                    raise
        if self.recorder.error is None:
            self.recorder.active = True
            self.scope.enabled = True

    def detach(self) -> None:
        self.recorder.active = False
        self.eager.exit()
        self.eager_compiled.exit()
        self.exit_mode()
        self.paused_mode = False
        if self.te is not None:
            self.te.uninstall()
        if self.attached is not None:
            self.scope.detach()
            self.attached = None

    def enter_mode(self) -> None:
        self.mode = GemmDispatchMode(self.recorder)
        self.mode.__enter__()

    def exit_mode(self) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None

    def pause(self) -> None:
        """Stop recording without detaching (between training batches: validation, logging)."""
        if self.recorder.error is None and self.attached is not None:
            self.recorder.active = False
            self.scope.enabled = False
            # The job's own work between steps runs its graphs and compiled code (and its dynamo stance).
            self.eager.exit()
            self.eager_compiled.exit()
            if self.mode is not None:
                self.exit_mode()
                self.paused_mode = True

    def resume(self) -> None:
        if self.recorder.error is None and self.attached is not None:
            self.eager.enter()
            self.eager_compiled.enter()
            self.scope.enabled = True
            self.recorder.active = True
            if self.paused_mode:
                self.paused_mode = False
                self.enter_mode()
