import type { INodeProperties } from 'n8n-workflow';
import { compact, json, options, segment } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['task'], operation: ['recordResult'] };

export const recordResultDescription: INodeProperties[] = [
	{
		displayName: 'Call ID',
		name: 'callId',
		type: 'string',
		default: '',
		required: true,
		placeholder: "e.g. {{ $('Admit Tool Call').item.json.loopstop.call_id }}",
		description: 'The call ID the Admit Tool Call answer gave',
		displayOptions: { show },
	},
	{
		displayName: 'Status',
		name: 'status',
		type: 'options',
		default: 'ok',
		options: [
			{ name: 'Fatal', value: 'fatal', description: 'Failed for good' },
			{ name: 'Needs Human', value: 'needs_human', description: 'A person has to look' },
			{ name: 'OK', value: 'ok', description: 'The tool did its job' },
			{ name: 'Retryable', value: 'retryable', description: 'Failed; trying again may work' },
			{ name: 'Unknown', value: 'unknown', description: 'A write whose outcome is unknown' },
		],
		description: 'How the call ended',
		displayOptions: { show },
	},
	{
		displayName: 'Result',
		name: 'result',
		type: 'json',
		default: '={{ $json }}',
		description: 'What the tool returned (fingerprinted for the no-progress rule, never logged)',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Evidence',
			name: 'evidence',
			type: 'json',
			default: '{}',
			description:
				'Trusted evidence from the system of record: {"revision": 12, "done": false, "effect": "committed"}',
		},
		{
			displayName: 'Receipt',
			name: 'receipt',
			type: 'json',
			default: '',
			description: 'For a write: the receipt a replay returns',
		},
	]),
];

/** `POST /v1/tasks/{id}/tool-calls/{call_id}/result`: record how a call ended. */
export const recordResult: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/tasks/${segment(this, 'taskId', i)}/tool-calls/${segment(this, 'callId', i)}/result`,
			body: compact({
				execution_mode: flow.executionMode,
				status: String(this.getNodeParameter('status', i)),
				result: json(this, 'result', i) as never,
				receipt: json(this, 'additionalFields.receipt', i) as never,
				evidence: options(this, 'additionalFields.evidence', i),
			}),
		};
	},
};
