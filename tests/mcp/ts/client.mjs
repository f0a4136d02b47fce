// The TypeScript SDK's own client over streamable HTTP: list the tools, call one.
// Usage: node client.mjs <mcp url>   (MCP_KEY, MCP_TOOL, MCP_ARGUMENTS in the env)
// Prints one JSON line: {"tools": [...names], "result": <the CallToolResult>}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_KEY}` } },
});
const client = new Client({ name: "portal-ts-test", version: "1.0.0" });
await client.connect(transport);
const listed = await client.listTools();
const result = await client.callTool({
  name: process.env.MCP_TOOL,
  arguments: JSON.parse(process.env.MCP_ARGUMENTS),
});
process.stdout.write(
  JSON.stringify({ tools: listed.tools.map((tool) => tool.name), result }) + "\n",
);
await client.close();
