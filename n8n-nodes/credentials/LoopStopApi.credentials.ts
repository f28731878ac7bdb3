import type {
	IAuthenticateGeneric,
	Icon,
	ICredentialTestRequest,
	ICredentialType,
	INodeProperties,
} from 'n8n-workflow';

/**
 * The loopstop sidecar's address and bearer token.
 *
 * The token is sent as `Authorization: Bearer <token>` on every request. The
 * credential test calls `GET /v1/whoami`, which answers 401 to a token the
 * sidecar does not know, so a wrong token fails the test.
 */
export class LoopStopApi implements ICredentialType {
	name = 'loopStopApi';

	displayName = 'Loop Stop API';

	icon: Icon = { light: 'file:../icons/loopstop.svg', dark: 'file:../icons/loopstop.dark.svg' };

	documentationUrl = 'https://github.com/loopstop/loopstop#use-it-from-n8n';

	properties: INodeProperties[] = [
		{
			displayName: 'Base URL',
			name: 'baseUrl',
			type: 'string',
			default: 'http://127.0.0.1:8765',
			placeholder: 'http://loopstop:8765',
			description: 'Where the loopstop sidecar listens, without a trailing path',
		},
		{
			displayName: 'Token',
			name: 'token',
			type: 'string',
			typeOptions: { password: true },
			default: '',
			description: 'A token from the tokens section of the sidecar configuration',
		},
	];

	authenticate: IAuthenticateGeneric = {
		type: 'generic',
		properties: {
			headers: {
				Authorization: '=Bearer {{$credentials?.token}}',
			},
		},
	};

	test: ICredentialTestRequest = {
		request: {
			baseURL: '={{$credentials?.baseUrl}}',
			url: '/v1/whoami',
			method: 'GET',
		},
	};
}
