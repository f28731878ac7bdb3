import type { INodeProperties } from 'n8n-workflow';
import { compact, json, keys, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['activation'], operation: ['checkTrigger'] };

export const checkTriggerDescription: INodeProperties[] = [
	{
		displayName: 'Event Key',
		name: 'eventKey',
		type: 'string',
		default: '',
		placeholder: 'e.g. sheet:orders:{{ $json.order_key }}',
		description:
			'What identifies the event, such as a row ID, a Gmail message ID or a webhook event ID. Without it the content is the identity.',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Content',
			name: 'content',
			type: 'json',
			default: '',
			description:
				'The fields compared with what this workflow wrote (default: the item, or a webhook body)',
		},
		{
			displayName: 'Event',
			name: 'event',
			type: 'json',
			default: '',
			description:
				'What the sidecar searches for a chain marker and compares (default: the whole item). Send less for large items such as full emails: the request limit is 256 KiB.',
		},
		{
			displayName: 'Marker',
			name: 'marker',
			type: 'string',
			default: '',
			description:
				'A chain marker (ls1.…) read from the event; by default the whole item is searched for one',
		},
		{
			displayName: 'Related Keys',
			name: 'relatedKeys',
			type: 'string',
			default: '',
			description:
				'Keys of what this event answers, such as In-Reply-To and References: one per line, or an array from an expression',
		},
		{
			displayName: 'Subject Key',
			name: 'subjectKey',
			type: 'string',
			default: '',
			description:
				'What the rate limit counts by, such as the sender address (default: the event key)',
		},
		{
			displayName: 'Trigger',
			name: 'trigger',
			type: 'string',
			default: '',
			description: 'The trigger node name, for the decision log',
		},
	]),
];

/** `POST /v1/activations`: Proceed, or Drop an echo, a duplicate or a chain past its limits. */
export const checkTrigger: LoopStopOperation = {
	outputs: ['Proceed', 'Drop'],
	errorOutput: 'Drop',
	request(i, flow) {
		const given = json(this, 'additionalFields.event', i);
		const event = given === undefined ? (this.getInputData()[i]?.json ?? {}) : given;
		return {
			method: 'POST',
			path: '/v1/activations',
			body: compact({
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				event_key: text(this, 'eventKey', i),
				subject_key: text(this, 'additionalFields.subjectKey', i),
				related_keys: keys(this, 'additionalFields.relatedKeys', i),
				trigger: text(this, 'additionalFields.trigger', i),
				marker: text(this, 'additionalFields.marker', i),
				content: json(this, 'additionalFields.content', i) as never,
				event,
			}),
		};
	},
	route(answer) {
		return { proceed: 'Proceed', drop: 'Drop' }[String(answer.decision)];
	},
};
