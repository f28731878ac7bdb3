import type { INodeProperties } from 'n8n-workflow';
import { compact, json, segment, text } from '../../shared/parameters';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['task'], operation: ['admitToolCall'] };

export const admitToolCallDescription: INodeProperties[] = [
	{
		displayName: 'Tool',
		name: 'tool',
		type: 'string',
		default: '',
		required: true,
		placeholder: 'e.g. create_refund',
		description: 'The tool’s name, as the agent knows it',
		displayOptions: { show },
	},
	{
		displayName: 'Kind',
		name: 'kind',
		type: 'options',
		default: 'read',
		options: [
			{
				name: 'Poll',
				value: 'poll',
				description: 'Waits for something to change; repeats are expected',
			},
			{ name: 'Read', value: 'read', description: 'Reads; repeating it changes nothing' },
			{ name: 'Write', value: 'write', description: 'Changes something; replayed, never repeated' },
		],
		description: 'What the tool does',
		displayOptions: { show },
	},
	{
		displayName: 'Arguments',
		name: 'args',
		type: 'json',
		default: '={{ $json }}',
		description: 'The arguments the agent gave the tool',
		displayOptions: { show },
	},
	{
		displayName: 'Operation ID',
		name: 'writeOperationId',
		type: 'string',
		default: '',
		required: true,
		placeholder: 'e.g. refund-{{ $json.order_id }}',
		description:
			'The idempotency key of the write: a committed write is replayed with its receipt, never executed twice',
		displayOptions: { show: { ...show, kind: ['write'] } },
	},
];

/**
 * `POST /v1/tasks/{id}/tool-calls`: Execute the tool, Replay a write's
 * receipt, or Deny (budget, identical call, cycle, no progress, stopped).
 * The Deny item carries `loopstop.message`, a text to hand back to the agent.
 */
export const admitToolCall: LoopStopOperation = {
	outputs: ['Execute', 'Replay', 'Deny'],
	errorOutput: 'Deny',
	request(i, flow) {
		const kind = String(this.getNodeParameter('kind', i));
		return {
			method: 'POST',
			path: `/v1/tasks/${segment(this, 'taskId', i)}/tool-calls`,
			body: compact({
				execution_mode: flow.executionMode,
				tool: text(this, 'tool', i),
				kind,
				args: (json(this, 'args', i) ?? null) as never,
				operation_id: kind === 'write' ? text(this, 'writeOperationId', i) : undefined,
			}),
		};
	},
	route(answer) {
		return { execute: 'Execute', replay: 'Replay', deny: 'Deny' }[String(answer.decision)];
	},
};
