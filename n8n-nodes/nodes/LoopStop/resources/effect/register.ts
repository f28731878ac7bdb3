import type { IDataObject, INodeProperties } from 'n8n-workflow';
import { NodeOperationError } from 'n8n-workflow';
import { compact, json, keys, positive, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['effect'], operation: ['register'] };

export const registerDescription: INodeProperties[] = [
	{
		displayName: 'Target Keys',
		name: 'targetKeys',
		type: 'string',
		default: '',
		required: true,
		placeholder: 'e.g. sheet:orders:{{ $json.order_key }}',
		description:
			'The event keys the write will come back as (a row key, the sent message ID): one per line, or an array from an expression',
		displayOptions: { show },
	},
	{
		displayName: 'Content',
		name: 'content',
		type: 'json',
		default: '',
		required: true,
		description:
			'The record as written, every field (not only the changed ones), as the trigger will show it. A field that differs when it comes back means someone else changed it.',
		displayOptions: { show: { ...show, keyOnly: [false] } },
	},
	{
		displayName: 'Match on Key Only',
		name: 'keyOnly',
		type: 'boolean',
		default: false,
		description:
			'Whether anything arriving with these keys is this write coming back, whatever its content (for keys only this write can have, such as a sent message ID)',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Chain ID',
			name: 'chainId',
			type: 'string',
			default: '',
			placeholder: "e.g. {{ $('Check Trigger').item.json.loopstop.chain_id }}",
			description: 'The chain of the activation that led to this write (default: the workflow)',
		},
		{
			displayName: 'Strict',
			name: 'strict',
			type: 'boolean',
			default: false,
			description: 'Whether to compare values exactly instead of normalizing numbers and text',
		},
		{
			displayName: 'TTL (Seconds)',
			name: 'ttlS',
			type: 'number',
			default: 0,
			description: 'How long the effect is remembered (default: as long as its chain)',
		},
	]),
];

/** `POST /v1/effects`: register a write so that its return is recognized as an echo. */
export const register: LoopStopOperation = {
	request(i, flow) {
		const keyOnly = this.getNodeParameter('keyOnly', i, false) === true;
		const content = keyOnly ? {} : json(this, 'content', i);
		if (
			!keyOnly &&
			(content === null ||
				typeof content !== 'object' ||
				Array.isArray(content) ||
				!Object.keys(content).length)
		) {
			throw new NodeOperationError(
				this.getNode(),
				'Content must be the record as written (a JSON object with its fields)',
				{
					itemIndex: i,
					description:
						'An empty content matches anything that comes back with these keys; turn on Match on Key Only if that is what you mean.',
				},
			);
		}
		return {
			method: 'POST',
			path: '/v1/effects',
			body: compact({
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				chain_id: text(this, 'additionalFields.chainId', i),
				target_keys: keys(this, 'targetKeys', i),
				content: (content ?? {}) as IDataObject,
				ttl_s: positive(this, 'additionalFields.ttlS', i),
				strict: this.getNodeParameter('additionalFields.strict', i, false) ? true : undefined,
			}),
		};
	},
};
