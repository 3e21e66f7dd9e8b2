// Times the unmodified E2B SDK's Sandbox.create() one call at a time, for
// internal/front/e2b's BenchmarkE2BCreateHot: each line read on stdin is an
// API URL to create against; each answer is a line {"ms": N, "id": ID}
// (or {"error": ...}). E2B_API_KEY is taken from the environment. The
// sandbox is not killed here: the caller removes it, outside the timing.
import { Sandbox } from 'e2b'
import { createInterface } from 'node:readline'

for await (const line of createInterface({ input: process.stdin })) {
  const apiUrl = line.trim()
  if (!apiUrl) continue
  try {
    const t = performance.now()
    const sbx = await Sandbox.create({ apiUrl, sandboxUrl: apiUrl })
    const ms = performance.now() - t
    console.log(JSON.stringify({ ms, id: sbx.sandboxId }))
  } catch (e) {
    console.log(JSON.stringify({ error: String(e) }))
  }
}
