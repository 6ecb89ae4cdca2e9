"""One search of a job, wired as ``kernelforge search`` and ``kernelforge.api.run`` both run it:
the compile workers the environment asks for (``compile_workers_from_env``), the job's LLM proposer
(none without an ``[llm]`` table) and its point adviser. The wiring of a run lives here, at the top,
so that the search below never imports the LLM generator: it reaches it only through its seams
(:class:`~kernelforge.search.proposer.Proposer`, :data:`~kernelforge.search.proposer.AdvisorFactory`). The callers open the store and
report; this is the part they share, with :func:`preflight`: what a search checks before its database
is created (``--dry-run`` runs it too)."""

from __future__ import annotations

from kernelforge.catalog import Catalog
from kernelforge.compile.pool import compile_workers_from_env
from kernelforge.execute.executor import check_device
from kernelforge.job import Job, require_llm_endpoint
from kernelforge.llm.advisor import advice_for
from kernelforge.llm.proposer import for_job
from kernelforge.search.evaluation_loop import SearchOutcome
from kernelforge.search.plan import baseline_candidates
from kernelforge.search.search import Search
from kernelforge.search.progress import Progress
from kernelforge.store.store import Store


def run_search(job: Job, catalog: Catalog, store: Store, progress: Progress, *, device_name: str | None = None,
               compile_enabled: bool = True, in_process: bool = False, reconfirm: bool = False,
               accept_block_change: bool = False, pool=None) -> SearchOutcome:
    """Run (or resume) ``job``'s search as one of its workers; ``pool`` compiles ahead elsewhere
    (a Ray cluster's CPUs), else compiles run on this host."""
    return Search(job, catalog, store, progress, device_name=device_name, compile_enabled=compile_enabled,
                  in_process=in_process, compile_workers=compile_workers_from_env(), pool=pool,
                  proposer=for_job(job, store, progress), advisor=advice_for,
                  reconfirm=reconfirm, accept_block_change=accept_block_change).run()


def preflight(job: Job, catalog: Catalog, device_name: str | None, *, endpoint: bool = True) -> None:
    """What a search of ``job`` checks before its database is created, one UserError each: the
    LLM's endpoint (unless not ``endpoint``: a dry run shows a job whose endpoint a run's ``--llm``
    gives), the device, and every shape's baseline point (a rule of the block's ``[[baselines]]``
    that names an unknown dimension or gives a point outside the space is refused now, not when
    the baselines are measured). The warm start's sources are checked once the store is open
    (:func:`kernelforge.search.warm.check_sources`)."""
    if endpoint:
        require_llm_endpoint(job)
    check_device(device_name or job.device, job.storage_url)
    for spec in job.blocks:
        baseline_candidates(catalog, spec.id, catalog.block(spec.id).shapes(spec.shapes))
