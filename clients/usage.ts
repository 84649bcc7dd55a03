// A TypeScript client's everyday calls, type-checked (tsc --strict) against the types
// openapi-typescript generates from docs/openapi.json (tests/api/test_openapi.py).
import type { components, paths } from "./torchyard";

type Schemas = components["schemas"];
type SubmitBody = paths["/jobs"]["post"]["requestBody"]["content"]["application/json"];
type Submitted = paths["/jobs"]["post"]["responses"][201]["content"]["application/json"];
type MetricsQuery = NonNullable<paths["/jobs/{job_id}/metrics"]["get"]["parameters"]["query"]>;
type MetricsPage = paths["/jobs/{job_id}/metrics"]["get"]["responses"][200]["content"]["application/json"];
type RecordBody = paths["/jobs/{job_id}/records"]["post"]["requestBody"]["content"]["application/json"];

// Submit the README's first job: the server defaults every field left out.
export const firstJob: SubmitBody = { model: "mlp", dataset: "digits", epochs: 3, nproc_per_node: 2 };

// @ts-expect-error epochs is a number: "5" is refused by the server and by the type
export const wrongType: SubmitBody = { epochs: "5" };

// Read a metrics page with its cursor: the next request starts after the last record seen.
export function nextPage(page: MetricsPage, limit = 1000): MetricsQuery {
  return { after: page.next_after, limit };
}

export function lastLoss(page: MetricsPage): number | "NaN" | "Infinity" | "-Infinity" | null {
  const losses = page.items.filter((r) => r.name === "loss");
  return losses.length ? losses[losses.length - 1].value : null;
}

// Post a record batch as a rank does (non-finite values travel as strings).
export const batch: RecordBody = {
  records: [
    { attempt: 1, rank: 0, epoch: 0, name: "loss", value: 0.42, time: 1_700_000_000 },
    { rank: 1, epoch: 0, step: 10, name: "loss", value: "NaN", time: 1_700_000_000.5 },
  ],
};

// Read a job's state.
export function isFinished(job: Submitted | Schemas["JobRead"]): boolean {
  const state: Schemas["JobState"] = job.state;
  return state === "succeeded" || state === "failed" || state === "cancelled";
}
