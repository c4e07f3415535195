"""Health and Prometheus metrics; open without a key, like vLLM's."""

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse

from chatsvc.api.deps import ServiceDep
from chatsvc.api.schemas import Health

router = APIRouter(tags=["system"])


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(service: ServiceDep, response: Response) -> Health:
    """200 when the engine serves; 503 while the model loads, or if the engine failed or died."""
    state = service.engines.state
    if state != "ready":
        response.status_code = 503
    return Health(status="ok" if state == "ready" else state, model=service.engines.model_name)


@router.get("/metrics", response_class=PlainTextResponse, response_model=str)
def metrics(service: ServiceDep) -> str:
    return service.metrics.render().decode()
