-- wrk script: POST /api/track with a realistic event (anonymous; rotating session ids).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  local body = string.format(
    '{"event":"page_view","session_id":"bench-%d","props":{"path":"/pricing","ref":"bench","n":%d}}',
    n % 1000, n)
  return wrk.format(nil, "/api/track", nil, body)
end
